"""The project's Markdown pages as the tests read them: their links, their headings' anchors and the commands their
bash blocks show. It imports nothing of the package, so the template's own tests read a bake's pages with it too."""
import re
from pathlib import Path


def github_anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code spans, where brackets and hashes are not Markdown."""
    return re.sub(r"`[^`\n]*`", "", without_code_blocks(text))


def links(text: str) -> list[str]:
    """Every Markdown link's target that is not on the web."""
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", prose(text))
            if not re.match(r"[a-z]+:", target)]


def anchors(page: Path) -> set[str]:
    return {github_anchor(title) for title in re.findall(r"^#{1,6} (.+)$", without_code_blocks(page.read_text()), re.M)}


def commands(text: str, *modules: str) -> list[tuple[int, str]]:
    """Each command of the page's bash blocks that runs `-m <module>` for one of `modules`, its continued lines joined
    into one, with the number of the line it starts on."""
    runs = re.compile(rf"-m ({'|'.join(map(re.escape, modules))})(\s|$)")
    found = []
    for block in re.finditer(r"^```bash\n(.*?)^```", text, re.M | re.S):
        number = text.count("\n", 0, block.start(1)) + 1
        for command in re.split(r"(?<!\\)\n", block[1]):
            if runs.search(command):
                found.append((number, command.replace("\\\n", " ")))
            number += command.count("\n") + 1
    return found


def broken_links(page: Path) -> list[str]:
    """The page's relative links that lead to no file, or to a heading its page does not have."""
    broken = []
    for target in links(page.read_text()):
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        if not found.exists() or (anchor and found.suffix == ".md" and anchor not in anchors(found)):
            broken.append(target)
    return broken
