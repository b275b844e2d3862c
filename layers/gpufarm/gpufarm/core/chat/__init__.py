"""What gpufarm says in Slack and reads back: messages, operator cards, links, the reason form, command text."""
