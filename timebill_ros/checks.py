"""Validation helpers shared by both wings: each raises naming the bad value, never asserts.

``check_int`` / ``check_nonneg_real`` return the checked value (TypeError for a wrong type,
ValueError for a bad value); ``check_positive`` / ``check_count`` / ``check_choice`` only check,
as the parameter dataclasses want (``check_count`` raises ValueError for any bad value, a
wrong type included).
"""

import math
import numbers


def check_int(name, value, minimum=0):
    """Return ``value`` (e.g. a token count) as an int; raise unless it is an int >= minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f'{name} must be an int, got {value!r}')
    if value < minimum:
        raise ValueError(f'{name} must be >= {minimum}, got {value!r}')
    return int(value)


def check_nonneg_real(name, value):
    """Return ``value`` as a float; raise unless it is a finite real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f'{name} must be a number, got {value!r}')
    if not math.isfinite(value) or value < 0:
        raise ValueError(f'{name} must be finite and >= 0, got {value!r}')
    return float(value)


def check_positive(name, value):
    """Raise unless ``value`` is a finite number > 0 (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f'{name} must be a number, got {value!r}')
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f'{name} must be finite and > 0, got {value!r}')


def check_count(name, value, minimum=1, maximum=None):
    """Raise ValueError unless ``value`` is an int in [minimum, maximum] (a bool is not one)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f'{name} must be an int >= {minimum}, got {value!r}')
    if maximum is not None and value > maximum:
        raise ValueError(f'{name} must be <= {maximum}, got {value!r}')


def check_choice(name, value, choices):
    """Raise ValueError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f'{name} must be one of {choices}, got {value!r}')


def check_text(name, value):
    """Return ``value``; raise unless it is a non-empty string."""
    if not isinstance(value, str):
        raise TypeError(f'{name} must be a string, got {value!r}')
    if not value:
        raise ValueError(f'{name} must not be empty')
    return value


def check_lengths(name, values, minimum_count=1):
    """Return ``values`` (token counts) as a strictly increasing tuple of ints >= 1.

    Raises unless it holds at least ``minimum_count`` of them.
    """
    lengths = tuple(check_int(f'{name}[{i}]', v, 1) for i, v in enumerate(values))
    if any(x >= y for x, y in zip(lengths, lengths[1:])):
        raise ValueError(f'{name} must be strictly increasing, got {lengths!r}')
    if len(lengths) < minimum_count:
        raise ValueError(f'{name} needs >= {minimum_count} lengths, got {lengths!r}')
    return lengths
