"""An episode workflow as a user's file outside rlkit's package, named in a config by its path
(rollout.agent.workflow=/abs/path/press_workflow.py:episode, and its tool and tool-call parser the same way): the
loading by path is what the tests that name this file check. The task itself is the CPU agent example's
(rlkit/agent/press_door.py), which a user's file may import like any other library.
"""

from __future__ import annotations

from rlkit.agent.press_door import digits_press, episode, press

__all__ = ["digits_press", "episode", "press"]
