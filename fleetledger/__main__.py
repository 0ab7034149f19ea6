"""``python -m fleetledger``: the same command line as the ``fleetledger`` script (``bench serve``
and the failover tests start servers this way)."""

from fleetledger.adapters.cli import main

raise SystemExit(main())
