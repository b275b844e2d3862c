"""Function handlers: parse and validate the event, build collaborators once per container, call the core, answer.

functions/<name>/<name>.py are one-line Lambda entry points over these modules, so the same code runs in Lambda,
under the local function host, and in tests.
"""
