"""Who may do what and how much: the request policy, charging whole hosts, team membership."""
