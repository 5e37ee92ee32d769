"""The dashboard inside Django admin (docs/how-to/dashboard.md): its reads, its
actions, its views, and the figures workers keep for it."""
