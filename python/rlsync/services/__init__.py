"""Long-running services of the trainer library (the `router` extra): the admin
router in front of several engines, and the trainer's control API."""
