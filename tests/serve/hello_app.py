"""The smallest Serve app: what a start that only tests Ray and Serve themselves deploys in seconds."""

from __future__ import annotations

from ray import serve


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Hello:
    async def __call__(self, _request) -> str:
        return "hello"


app = Hello.bind()
