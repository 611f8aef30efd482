"""The RLAIF loop's I/O: rollouts, rewards, the teacher, held-out evaluation."""
