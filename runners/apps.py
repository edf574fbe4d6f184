from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"

    def ready(self) -> None:
        from runners.registry import all_runners

        # Build every configured runner now, so a bad alias or unknown option stops start-up.
        all_runners()
