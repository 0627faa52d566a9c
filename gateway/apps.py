from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway (the proxy, its admission and routing)"

    def ready(self) -> None:
        # Admin edits of keys, endpoints, replicas and reservations reach every proxy within a second. Imported here,
        # in ready(): the receivers import models, which exist only once the app registry is loaded.
        from gateway.proxy import signals

        signals.connect()
