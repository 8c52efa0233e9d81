"""The plan: which records make each step's batch, and the work items executors load."""

from loadax.plan.planner import PLAN_VERSION, Plan, Rows

__all__ = ["PLAN_VERSION", "Plan", "Rows"]
