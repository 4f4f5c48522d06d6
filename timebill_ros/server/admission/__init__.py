"""Admission policies: which goals may run, decided before any model work."""

from timebill_ros.server.admission.accept_all import AcceptAllPolicy
from timebill_ros.server.admission.base import AdmissionPolicy, Verdict
from timebill_ros.server.admission.feasibility import FeasibilityPolicy

POLICIES = {'feasibility': FeasibilityPolicy, 'none': AcceptAllPolicy}


def make_admission(name, time_model):
    """Return the admission policy ``name`` ('feasibility' or 'none') over ``time_model``."""
    if name not in POLICIES:
        raise ValueError(f'unknown admission policy {name!r}; expected one of {sorted(POLICIES)}')
    return POLICIES[name](time_model)


__all__ = ['AdmissionPolicy', 'Verdict', 'FeasibilityPolicy', 'AcceptAllPolicy', 'POLICIES',
           'make_admission']
