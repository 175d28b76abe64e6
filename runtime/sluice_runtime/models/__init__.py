"""Model architectures and weight loading."""
