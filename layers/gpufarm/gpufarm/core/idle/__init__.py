"""Idle alerts: warnings delivered before they are recorded, partial reclaim, keeps and exemptions."""
