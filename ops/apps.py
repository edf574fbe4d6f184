import gc

from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = "Operations"

    def ready(self) -> None:
        # What exists once the apps are loaded (modules, models, settings, about 100,000 objects)
        # lives as long as the process: move it out of the collector's generations, so that a full
        # collection, which allocation-heavy work (a bulk create of 1,000 tasks: several per
        # batch) sets off, no longer walks it each time. A create's profile spent a quarter of its
        # Python time in those collections (docs/benchmarks.md, issue 33). Objects made later are
        # collected as before.
        gc.freeze()
