"""``python -m fleetledger``: the same command line as the ``fleetledger`` script."""

from fleetledger.adapters.cli import main

raise SystemExit(main())
