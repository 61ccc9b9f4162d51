"""Development tools of the checkout: not part of the wheel."""
