"""The checker service and the Spark audit jobs."""
