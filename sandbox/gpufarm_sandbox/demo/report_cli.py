"""`gpufarm report` run inside the demo's process, as the command line runs it: the report and chargeback stages
read its output and exit status without a subprocess (the local function host's seams apply)."""

from __future__ import annotations

import contextlib
import io


def invoke_report(args: list[str]) -> tuple[int, str]:
    """Run `gpufarm report ARGS` in this process, as the command line does; its exit status and output."""
    import click

    from gpufarm.cli.report import report

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            report.main(args, prog_name="gpufarm report", standalone_mode=False)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
    return code, out.getvalue()
