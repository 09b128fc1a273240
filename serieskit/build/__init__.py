"""Making things from the series: its native module, the overlay on a released wheel."""
