"""``python manage.py bench planner``: the capacity planner's figures (see ``planner``)."""
