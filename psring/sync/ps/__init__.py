"""The ZeroMQ parameter server: wire format, sharding, the server's shard store and socket loop, and the
worker-side client and synchronizer."""
