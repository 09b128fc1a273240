"""Making things from the series: its native module, the overlay, an installable wheel."""
