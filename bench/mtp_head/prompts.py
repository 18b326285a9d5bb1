"""The prompt sets of the SmolLM2 draft head (bench/mtp_head/README.md): a seeded training set built from
templates x subjects, and the fixed evaluation set (chat, code, JSON) the speculative-decoding benchmark uses.

The evaluation prompts' subjects appear in no training template or subject list, so the head is measured on
answers it was not trained on (the same model answering, so the same style).
"""

from __future__ import annotations

import random

# (family, template); {a} and {b} are filled from the family's subject list.
TRAIN_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("chat", "Explain {a} in simple terms."),
    ("chat", "What are the main differences between {a} and {b}?"),
    ("chat", "Give me three practical tips about {a}."),
    ("chat", "Write a short story about {a}."),
    ("chat", "Summarize the history of {a} in one paragraph."),
    ("chat", "Why is {a} important? Answer in a few sentences."),
    ("chat", "Write a short poem about {a}."),
    ("chat", "List the pros and cons of {a}."),
    ("code", "Write a Python function that {a}."),
    ("code", "Write a JavaScript function that {a}."),
    ("code", "Write a C function that {a}."),
    ("code", "Explain step by step how to write a program that {a}."),
    ("code", "Write a Python class with a method that {a}, and show an example of using it."),
    ("json", "Return a JSON object describing {a} with the fields name, category and description."),
    ("json", "Give a JSON array of three examples of {a}, each with a name and a short summary."),
    ("json", "Answer only with JSON: an object with keys \"topic\", \"facts\" (a list) and \"difficulty\" about {a}."),
    ("json", "Write a JSON schema for a record of {a}."),
)

CHAT_SUBJECTS: tuple[str, ...] = (
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "the immune system", "climate change",
    "the stock market", "machine learning", "the Roman Empire", "the printing press", "electric cars",
    "honey bees", "the moon landing", "recycling", "sleep", "meditation", "gardening", "chess", "the internet",
    "renewable energy", "earthquakes", "the human heart", "coffee", "the Olympic Games", "democracy",
    "vaccines", "ocean tides", "rainbows", "time management", "learning a new language", "public libraries",
    "bicycles", "the Silk Road", "dinosaurs", "friendship", "a lighthouse keeper", "a lost cat", "a robot chef",
    "a rainy afternoon", "a mountain village", "cloud computing", "the French Revolution", "nutrition",
    "public speaking", "saving money", "the solar system", "glaciers", "jazz music",
)

CODE_TASKS: tuple[str, ...] = (
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "finds the largest element of a list",
    "removes duplicates from a list", "sorts a list of numbers with bubble sort", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "merges two sorted lists", "computes the average of a list of numbers",
    "counts how often each word appears in a text", "flattens a nested list", "finds the greatest common divisor of two numbers",
    "checks whether a year is a leap year", "returns the sum of the digits of a number", "transposes a matrix",
    "finds the second largest number in a list", "capitalizes the first letter of every word",
    "implements binary search", "reads a file and counts its lines", "validates an email address",
    "computes the area of a circle", "generates a random password",
)

JSON_SUBJECTS: tuple[str, ...] = (
    "a book", "a movie", "a city", "a planet", "a programming language", "a car", "a dog breed", "a recipe",
    "a musical instrument", "a sports team", "an employee", "a customer order", "a university course",
    "a smartphone", "a hotel", "a flight", "a museum", "a video game", "a fruit", "a bird species",
)

_SUBJECTS = {"chat": CHAT_SUBJECTS, "code": CODE_TASKS, "json": JSON_SUBJECTS}

# The fixed evaluation set: four of each family, subjects outside the training lists.
EVAL_PROMPTS: tuple[tuple[str, str], ...] = (
    ("chat", "What causes the seasons on Earth?"),
    ("chat", "Give me some advice for my first job interview."),
    ("chat", "Describe how a bill becomes a law."),
    ("chat", "Write a short story about a dragon who is afraid of the dark."),
    ("code", "Write a Python function that checks whether two strings are anagrams."),
    ("code", "Write a Python function that returns all prime numbers below n using a sieve."),
    ("code", "Write a JavaScript function that counts the words in a sentence."),
    ("code", "Write a Python function that converts a Roman numeral to an integer."),
    ("json", "Return a JSON object describing a laptop with the fields brand, model, price and specs."),
    ("json", "Give a JSON array of three national parks, each with a name, country and area."),
    ("json", "Answer only with JSON: a weather report for Paris with temperature, humidity and conditions."),
    ("json", "Write a JSON object for a restaurant menu with two dishes and their prices."),
)


def training_prompts(count: int, seed: int) -> list[tuple[str, str]]:
    """`count` distinct (family, prompt) pairs drawn with `seed` from the templates x subjects."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    while len(out) < count:
        family, template = rng.choice(TRAIN_TEMPLATES)
        subjects = _SUBJECTS[family]
        a, b = rng.sample(subjects, 2)
        prompt = template.format(a=a, b=b)
        if prompt not in seen:
            seen.add(prompt)
            out.append((family, prompt))
    return out
