"""`gpufarm doctor`: what a platform team runs on day one against its real Datadog org and Slack workspace.

gpufarm rests on some Datadog and Slack behaviours that are unconfirmed (docs/design.md, rule 13); doctor tries
each on the live org and says, one line per check, whether it is confirmed, fell back (gpufarm works another way)
or broken (what to fix): the keys and their permissions (keys), gpufarm's incident type and fields (objects), the
notification rule and webhook round trip on a probe incident (roundtrip), every search form gpufarm uses
(objects), a scratch tag on a named host (tags), the idle monitors validated (objects), the Slack token's scopes
and the operators' channel (chat) and the Function URLs (urls), run in that order by run.run_checks. The checks
call Datadog and Slack through ports (ports); gpufarm.cli.doctor passes the real adapters.
"""
