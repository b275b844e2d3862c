"""The security suite: one test module per class of the threat model (docs/security.md, "Threat model")."""
