"""``psring bench``: the synchronizers alone (no model), against their raw transports, per message size."""
