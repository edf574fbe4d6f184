"""Runner backends: adapters between an execution and the external executor that does the work."""
