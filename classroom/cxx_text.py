"""How the compiler reads C++ text, as far as the grader and the handout need it: comments, string
and character literals, and numbers with digit separators. `classroom/grade.py` lints a student's
region with it, and both it and `classroom/handout.py` ask it whether a region holds code (a
region without code in the solution is a launcher's marker, never the student's)."""

import re

DIGITS = "0123456789"  # what starts a number for the compiler (str.isdigit also takes other scripts' digits)


def identifier_char(c):
    """A character that continues a name: g++ also takes '$' and any non-ASCII character."""
    return c.isascii() and (c.isalnum() or c in "_$") or not c.isascii()


def pp_number_end(text, i):
    """Where the preprocessing number that starts at text[i] (a digit, or '.' and a digit) ends, as
    g++'s lexer reads it: then any letter, digit, '_', '$', non-ASCII character or quote, a '.' not
    right after a quote, and a sign after e, E, p or P; the quotes it ends with are not its own.
    So 1'000 is one number, and in 0x1'a'"' the number is 0x1'a and the next quote opens a
    character literal: a lint that read that quote as a separator would read the rest of the line
    differently from the compiler."""
    j, n = i + 1, len(text)
    while j < n:
        c, prev = text[j], text[j - 1]
        if c == "'" or identifier_char(c) or (c == "." and prev != "'") or (c in "+-" and prev in "eEpP"):
            j += 1
        else:
            break
    while j > i + 1 and text[j - 1] == "'":
        j -= 1
    return j


def strip_comments_and_strings(text, glued=None):
    """The code with comments, string and character literals blanked (their text kept aside).
    `glued`, a list when given, gets the offset of each quote that follows a number directly (a
    character literal glued to a number, as in 0x1'a'"', which compilers may split differently)."""
    out, strings, i, n = [], [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        elif text.startswith('R"', i) and re.search(r'(?<![A-Za-z0-9_])(u8|[LuU])?$', text[max(0, i - 3):i]):
            # A raw string R"delim( ... )delim": its text, then the code after it is read on.
            open_paren = text.find("(", i + 2)
            close = -1 if open_paren < 0 else text.find(")" + text[i + 2:open_paren] + '"', open_paren)
            end = n if close < 0 else close + len(text[i + 2:open_paren]) + 2
            strings.append(text[open_paren + 1:close] if close >= 0 else text[i:])
            out.append('""')
            i = end
        elif (c in DIGITS or (c == "." and i + 1 < n and text[i + 1] in DIGITS)) and not (
                i > 0 and identifier_char(text[i - 1])):
            # A number, with its digit separators (1'000, 0xffff'ffff): a quote inside it opens no
            # character literal.
            j = pp_number_end(text, i)
            out.append(text[i:j].replace("'", " "))
            if glued is not None and j < n and text[j] == "'":
                glued.append(j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            strings.append(text[i + 1:j])
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), strings


STUB = re.compile(r'\bFA_NOT_IMPLEMENTED\s*\(\s*""\s*\)\s*;')  # a student copy's stub, its message blanked


def has_code(body, stubs=True):
    """Whether a region's body holds code: anything left once comments and literals are blanked.
    stubs=False: a student copy's stubs (FA_NOT_IMPLEMENTED("...");) are not code either, as the
    handout reads a copy of a copy. The grader counts them (stubs=True): in a student copy, where
    every region holds one, a region with a stub is the student's, like a region with code in the
    instructor's tree; only a launcher's marker, blank in the instructor's tree, is not."""
    code = strip_comments_and_strings(body)[0]
    return bool((code if stubs else STUB.sub(" ", code)).strip())
