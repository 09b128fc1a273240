"""Moving the series upstream's way: rebase onto another base, check, carry to a port."""
