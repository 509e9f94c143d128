"""asyncrl.envs: environments, task sources, wrappers, the sandbox and the environment checker.

See docs/environments.md for the protocol, the built-in environments and how to write a plugin.
"""

from asyncrl.envs.base import (
    AnswerAction,
    Environment,
    EpisodeRewards,
    HashSplitTaskSource,
    MalformedAction,
    StepResult,
    SyncEnvironment,
    TaskSource,
    Tool,
    ToolCallAction,
    call_env,
    close_env,
    parse_action,
)
from asyncrl.envs.calculator import CalculatorEnv, CalculatorTasks
from asyncrl.envs.check import CheckReport, check_environment
from asyncrl.envs.kb_lookup import KBLookupEnv
from asyncrl.envs.python_env import PythonEnv
from asyncrl.envs.registry import (
    EnvPluginError,
    check_heldout,
    load_plugin,
    make_env,
    make_raw_env,
    make_task_source,
)
from asyncrl.envs.sandbox import SandboxLimits, SandboxResult, run_python, sandbox_support
from asyncrl.envs.scoring import load_scorer
from asyncrl.envs.strings import StringsEnv
from asyncrl.envs.tasks import read_rows
from asyncrl.envs.toolenv import CalcError, ToolEnv, evaluate
from asyncrl.envs.wrappers import EnvResetError, FaultWrapper, GuardedEnv, LatencyWrapper
from asyncrl.records import ToolCall  # the StepResult.tool_call field's type

__all__ = [
    "AnswerAction",
    "CalcError",
    "CalculatorEnv",
    "CalculatorTasks",
    "CheckReport",
    "EnvPluginError",
    "EnvResetError",
    "Environment",
    "EpisodeRewards",
    "FaultWrapper",
    "GuardedEnv",
    "HashSplitTaskSource",
    "KBLookupEnv",
    "LatencyWrapper",
    "MalformedAction",
    "PythonEnv",
    "SandboxLimits",
    "SandboxResult",
    "StepResult",
    "StringsEnv",
    "SyncEnvironment",
    "TaskSource",
    "Tool",
    "ToolCall",
    "ToolCallAction",
    "ToolEnv",
    "call_env",
    "check_environment",
    "check_heldout",
    "close_env",
    "evaluate",
    "load_plugin",
    "load_scorer",
    "make_env",
    "make_raw_env",
    "make_task_source",
    "parse_action",
    "read_rows",
    "run_python",
    "sandbox_support",
]
