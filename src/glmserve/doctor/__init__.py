"""`python -m glmserve.doctor [--env-file .env] [--profile P ...] [SERVICE ...]`: what would go
wrong, before compose starts anything.

- every name in the env file that .env.example does not list, with the nearest known one;
- every bad value, with the message the component itself would give (its own validators are
  called on the command line or environment compose.yaml builds from the value);
- the compose profiles (COMPOSE_PROFILES, --profile), and a stack with no server;
- on the host: Docker, the compose plugin, the NVIDIA runtime where a profile needs GPUs, and
  MODEL_DIR and the Grafana password where the services that use them start.

One line per problem and exit 1; exit 0 and one "ok" line when clean. compose.yaml's `doctor`
service runs it first (`--in-compose`: the env file and values only), and so does `make demo`.
"""
