"""Reading runs back: comparisons against a baseline, session goodput, a live view."""
