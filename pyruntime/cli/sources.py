"""`pyruntime.measurement.sources` under its old name: the measurement code moved below both of
its users (`cli` and `selfcheck`; docs/design.md, section 8). This name stays importable and
is the same module object, so attributes set on either name are seen by both."""

import sys

from pyruntime.measurement import sources

sys.modules[__name__] = sources
