"""Admission policies: which goals may run, decided before any model work."""

from timebill_ros import plugins
from timebill_ros.server.admission.accept_all import AcceptAllPolicy
from timebill_ros.server.admission.base import AdmissionPolicy, Verdict
from timebill_ros.server.admission.feasibility import FeasibilityPolicy

# The registry: the classes named in plugins.NAMES['admission policy'], in its order.
POLICIES = plugins.load('admission policy', AdmissionPolicy)


def make_admission(name, time_model):
    """Return the registered admission policy ``name`` over ``time_model``."""
    return plugins.choose('admission policy', POLICIES, name)(time_model)


__all__ = ['AdmissionPolicy', 'Verdict', 'FeasibilityPolicy', 'AcceptAllPolicy', 'POLICIES',
           'make_admission']
