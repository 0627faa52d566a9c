from django.apps import AppConfig


class EndpointsConfig(AppConfig):
    name = "endpoints"
    verbose_name = "Endpoints and replicas"

    def ready(self) -> None:
        # Admin edits of keys, endpoints, replicas and reservations reach every proxy within a second. Imported here,
        # in ready(): the receivers import models, which exist only once the app registry is loaded.
        from endpoints.proxy import signals

        signals.connect()
