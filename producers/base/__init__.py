"""The producers' base: what every producer shares (ports, publishing, paging, DRA parsing)."""
