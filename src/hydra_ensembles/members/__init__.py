"""Members: M diverse head maps from importance scores or circuits (head_maps.py), the pruned models they
describe (models.py), and how much their pruned heads overlap (overlap.py)."""

from .head_maps import check_distinct, sample_members
from .models import build_members
from .overlap import HeadOverlap, head_map_overlap

__all__ = ["HeadOverlap", "build_members", "check_distinct", "head_map_overlap", "sample_members"]
