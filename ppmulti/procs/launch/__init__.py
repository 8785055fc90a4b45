"""ppmulti launch: torchrun/fleetrun flags -> LaunchPlan -> Paddle 2.6's launcher (parse, plan, run)."""
