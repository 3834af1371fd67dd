"""Stream processors: the Faust worker that derives lifecycle, attribution, windows and alerts."""
