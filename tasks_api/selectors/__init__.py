"""Task reads that need more than a queryset, by topic:

- :mod:`.previews`: fire times of a schedule or a task, and where a task's runs end;
- :mod:`.fate`: what became of one fire time (shared by "why" and the timeline);
- :mod:`.why`: "why did this task (not) run at T?";
- :mod:`.timeline`: a task's occurrences over a window.

The names the API, the serializers and the settings use are importable from here.
"""

from tasks_api.selectors.fate import Fate, OccurrenceFate, occurrence_fate
from tasks_api.selectors.previews import FireTime, schedule_preview, task_last_fire_time, task_preview
from tasks_api.selectors.timeline import (
    OCCURRENCE_RECORDS_MAX,
    OCCURRENCES_MAX,
    OCCURRENCES_MAX_SPAN,
    Occurrence,
    OccurrenceSkip,
    OccurrenceState,
    OccurrenceWindow,
    task_occurrences,
)
from tasks_api.selectors.why import WhyAnswer, task_why

__all__ = [
    "OCCURRENCES_MAX",
    "OCCURRENCES_MAX_SPAN",
    "OCCURRENCE_RECORDS_MAX",
    "Fate",
    "FireTime",
    "Occurrence",
    "OccurrenceFate",
    "OccurrenceSkip",
    "OccurrenceState",
    "OccurrenceWindow",
    "WhyAnswer",
    "occurrence_fate",
    "schedule_preview",
    "task_last_fire_time",
    "task_occurrences",
    "task_preview",
    "task_why",
]
