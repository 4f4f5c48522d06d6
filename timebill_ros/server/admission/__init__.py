"""Admission policies: which goals may run, decided before any model work."""

from timebill_ros.checks import choose
from timebill_ros.server.admission.accept_all import AcceptAllPolicy
from timebill_ros.server.admission.base import AdmissionPolicy, Verdict
from timebill_ros.server.admission.feasibility import FeasibilityPolicy

# The registry (config.ADMISSION_POLICIES agrees with it: test/test_registries.py).
POLICIES = {cls.name: cls for cls in (FeasibilityPolicy, AcceptAllPolicy)}


def make_admission(name, time_model):
    """Return the registered admission policy ``name`` over ``time_model``."""
    return choose('admission policy', POLICIES, name)(time_model)


__all__ = ['AdmissionPolicy', 'Verdict', 'FeasibilityPolicy', 'AcceptAllPolicy', 'POLICIES',
           'make_admission']
