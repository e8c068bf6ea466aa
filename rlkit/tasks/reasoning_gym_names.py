"""reasoning-gym 0.1.25's task names and system prompts by name, known without importing it: the login node checks a
config against them (rlkit.checks.reasoning_gym) while reasoning-gym is installed only where rows are generated.
tests/unit/tasks/test_reasoning_gym_scores.py holds these equal to the installed reasoning-gym's."""

from __future__ import annotations

VERSION = "0.1.25"
COMPOSITE = "composite"  # reasoning-gym's mixer: rlkit mixes through reasoning_gym.tasks instead
TASKS = (
    "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion", "basic_arithmetic", "bf",
    "binary_alternation", "binary_matrix", "bitwise_arithmetic", "boxnet", "caesar_cipher", "calendar_arithmetic",
    "chain_sum", "circuit_logic", "codeio", "coin_flip", "color_cube_rotation", "complex_arithmetic", "composite",
    "count_bits", "count_primes", "countdown", "course_schedule", "cryptarithm", "decimal_arithmetic",
    "decimal_chain_sum", "dice", "emoji_mystery", "family_relationships", "figlet_font", "fraction_simplification",
    "futoshiki", "game_of_life", "game_of_life_halting", "gcd", "graph_color", "group_anagrams", "gsm_symbolic",
    "intermediate_integration", "isomorphic_strings", "jugs", "kakurasu", "knight_swap", "knights_knaves",
    "largest_island", "lcm", "leg_counting", "letter_counting", "letter_jumble", "list_functions", "mahjong_puzzle",
    "manipulate_matrix", "maze", "mini_sudoku", "modulo_grid", "n_queens", "needle_haystack", "number_filtering",
    "number_format", "number_sequence", "number_sorting", "palindrome_generation", "palindrome_partitioning",
    "path_star", "polynomial_equations", "polynomial_multiplication", "pool_matrix", "power_function",
    "prime_factorization", "products", "propositional_logic", "puzzle24", "quantum_lock", "ransom_note", "rearc",
    "rectangle_count", "rotate_matrix", "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference",
    "sentence_reordering", "shortest_path", "simple_equations", "simple_geometry", "simple_integration", "sokoban",
    "spell_backward", "spiral_matrix", "string_insertion", "string_manipulation", "string_splitting",
    "string_synthesis", "sudoku", "survo", "syllogism", "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder",
    "word_sequence_reversal", "word_sorting", "zebra_puzzles",
)
NO_SYSTEM_PROMPT = "none"
SYSTEM_PROMPTS = ("DeepSeekZero", "default", "simple", "direct", "chain_of_draft")
