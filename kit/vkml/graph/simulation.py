"""Placeholder replaced below."""


class Simulation:
    pass


class SimulationRecord:
    pass
