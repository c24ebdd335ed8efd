"""handrail."""
