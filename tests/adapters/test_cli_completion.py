"""``fleetledger completion``: a script per shell, generated from the running parser."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.cli.completion import SHELLS


class TestCompletion:
    @pytest.mark.parametrize("shell", SHELLS)
    def test_the_script_names_every_command(
        self, shell: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        for command in ("db", "events", "simulate", "serve", "completion"):
            assert command in script
        assert "--scenario" in script and "--url" in script

    def test_an_unknown_shell_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["completion", "powershell"])
        assert exit_.value.code == EXIT_USAGE
        assert "bash" in capsys.readouterr().err

    @pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
    def test_bash_loads_it_and_completes_a_command(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """bash sources the script without error, and completing ``fleetledger ev`` offers
        ``events``."""
        assert main(["completion", "bash"]) == 0
        script = capsys.readouterr().out
        probe = (
            script
            + '\nCOMP_WORDS=(fleetledger ev); COMP_CWORD=1; COMP_LINE="fleetledger ev";'
            + " COMP_POINT=${#COMP_LINE}; _shtab_fleetledger; printf '%s\\n' \"${COMPREPLY[@]}\""
        )
        result = subprocess.run(
            ["bash", "--norc", "-c", probe], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "events" in result.stdout.split()
