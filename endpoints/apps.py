from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "endpoints"
    verbose_name = "Endpoints and replicas"

    def ready(self) -> None:
        # Admin edits of keys, endpoints, replicas and reservations reach every proxy within a second.
        from endpoints.proxy import signals

        signals.connect()
