"""The operators' daily digest: what needs an operator's eye today, built from one read and posted once."""
