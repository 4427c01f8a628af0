"""pipedream_impl package."""
