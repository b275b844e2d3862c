"""The one-line answers the Slack ingress gives at once: the help, a user error, and "working on it".

Plain text only, so the ingress answers without importing the message builders and the models behind them
(tests/unit/test_ingress_imports.py); messages.py wraps each in its Block Kit message.
"""

from __future__ import annotations

from gpufarm.core.chat.escape import inert

HELP = """*`/gpu` — GPUs from the farm, tracked as Datadog incidents*
• `/gpu request` opens a form; or inline:
  `/gpu request 8 H100 project=llm-ko team=nlp env=onprem-hpc days=14 purpose="fine-tune"`
• `/gpu reserve 8 H100 env=onprem-hpc project=llm-ko from 2026-12-10 09:00 for 3d` — book a window (UTC)
• `/gpu calendar [env] [model]` — the pool's next two weeks: leases, reservations, free GPUs
• `/gpu list [mine | team [name] | all]` — allocations
• `/gpu status IR-123` — one allocation, its hosts, expiry and history
• `/gpu why IR-123` — why it waits, was refused or ended, with its place in the queue and the earliest start
• `/gpu release IR-123 [now]` — give the GPUs back (a Release button confirms it unless `now`)
• `/gpu extend IR-123 [days]` — keep them longer
• `/gpu quota [team]` — quotas and what is in use
• `/gpu budget [team]` — budgets this period: burn, when they run out at this rate, and what each live lease will
  cost to its end
• `/gpu quota request team=nlp +16 H100 env=onprem-hpc until 2027-01-31 reason="..."` — ask the operators for a
  temporary quota change
• `/gpu report [team | project]` — the last 30 days' GPU-hours (held, busy, idle), the CSV by DM
• `/gpu profile-token IR-123` — a token, shown to you alone, to upload profiler runs to your team's lease
Operators: `/gpu approve IR-123`, `/gpu reject IR-123 <reason>`, `/gpu reclaim IR-123 <reason>`,
`/gpu exempt IR-123 3d <reason>` (no idle reclaim until then)."""


def help_text(unknown: str | None = None) -> str:
    """The help text; names the word that was not understood. Inert as a whole: its `<reason>` is a placeholder,
    not a link, and the word is what someone typed."""
    return inert((f"I don't know `/gpu {unknown}`.\n" if unknown else "") + HELP)


def error_text(text: str) -> str:
    """A user error, said plainly; inert as a whole (errors quote what people typed and carry no markup)."""
    return f":warning: {inert(text)}"


def working_text(text: str) -> str:
    """The immediate ack while the worker does the slow part."""
    return f":hourglass_flowing_sand: {text}"
