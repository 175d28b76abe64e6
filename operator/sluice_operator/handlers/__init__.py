"""kopf handlers: thin glue from cluster events to the builders, the route compiler and the autoscaler."""
