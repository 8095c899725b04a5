"""The code environments (humaneval, coophumaneval, mbpp, classeval, codetest) and what only they use."""
