"""Members: M diverse head maps from importance scores or circuits (head_maps.py), and the pruned models they
describe (models.py)."""

from .head_maps import check_distinct, sample_members
from .models import build_members

__all__ = ["build_members", "check_distinct", "sample_members"]
