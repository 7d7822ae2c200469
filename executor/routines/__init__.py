"""Routines: runs that start without the user — a schedule's instants, and triggers the ingress verified
(run now, the fire token, a webhook). Each run is the first turn of a thread of its own."""

from executor.routines.service import RoutinesConfig, Routines

__all__ = ["Routines", "RoutinesConfig"]
