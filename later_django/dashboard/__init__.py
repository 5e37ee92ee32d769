"""The dashboard inside Django admin (docs/dashboard.md): its reads, its
actions, its views, and the figures workers keep for it."""
