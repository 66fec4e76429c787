"""The confusion matrix as a PNG, drawn with Pillow: a row per true class, a column per predicted one, each cell
shaded by its share of its row and labelled with its count where there is room. With many classes it shows those
with the most errors, so that every label stays readable."""
import torch
from PIL import Image, ImageDraw, ImageFont

MOST_SHOWN = 30  # classes drawn at most: beyond that, the ones with the most errors
LABEL_CHARACTERS = 24  # a longer class name is cut, with an ellipsis
PAD = 8


def shown(matrix: torch.Tensor) -> list[int]:
    """The classes to draw, in their order: all of them, or the MOST_SHOWN with the most images in wrong cells of
    their row or column."""
    if len(matrix) <= MOST_SHOWN:
        return list(range(len(matrix)))
    wrong = matrix.sum(dim=0) + matrix.sum(dim=1) - 2 * matrix.diag()
    return sorted(wrong.argsort(descending=True, stable=True)[:MOST_SHOWN].tolist())


def label(name: str) -> str:
    return name if len(name) <= LABEL_CHARACTERS else name[:LABEL_CHARACTERS - 1] + "…"


def draw_confusion(matrix: torch.Tensor, classes: list[str]) -> Image.Image:
    picked = shown(matrix)
    part = matrix[picked][:, picked].tolist()
    rows = matrix[picked].sum(dim=1).tolist()  # each true class's images, the undrawn columns' included
    cell = max(16, min(44, 720 // len(picked)))
    font = ImageFont.load_default(size=max(9, cell * 9 // 20))
    names = [label(classes[index]) for index in picked]
    text_width = int(max(font.getlength(name) for name in names)) + PAD
    title = (f"confusion matrix: the {len(picked)} classes with the most errors, of {len(classes)}" if len(picked) <
             len(classes) else f"confusion matrix, {len(classes)} classes") + "; shade: share of the row"
    top = 2 * cell + text_width  # the title and the axis name, then the rotated column labels
    left = cell + text_width + PAD  # the axis name, then the row labels
    size = len(picked) * cell
    image = Image.new("RGB", (max(left + size + PAD, int(font.getlength(title)) + 2 * PAD), top + size + PAD), "white")
    draw = ImageDraw.Draw(image)
    draw.text((PAD, PAD), title, fill="black", font=font)
    draw.text((left, cell + PAD), "predicted class", fill="black", font=font)
    for row, (name, counts) in enumerate(zip(names, part)):
        y = top + row * cell
        draw.text((left - PAD, y + cell / 2), name, fill="black", font=font, anchor="rm")
        for column, count in enumerate(counts):
            share = count / rows[row] if rows[row] else 0.0
            x = left + column * cell
            shade = (round(255 - 215 * share), round(255 - 160 * share), 255)
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=shade, outline=(220, 220, 220))
            if count and cell >= 22:
                draw.text((x + cell / 2, y + cell / 2), str(count), font=font, anchor="mm",
                          fill="white" if share > 0.5 else "black")
    columns = Image.new("RGB", (text_width, size), "white")  # the column labels, written across, then turned upright
    column_draw = ImageDraw.Draw(columns)
    for column, name in enumerate(names):
        column_draw.text((PAD, column * cell + cell / 2), name, fill="black", font=font, anchor="lm")
    image.paste(columns.rotate(90, expand=True), (left, 2 * cell))
    axis = Image.new("RGB", (size, cell), "white")
    ImageDraw.Draw(axis).text((0, cell / 2), "true class", fill="black", font=font, anchor="lm")
    image.paste(axis.rotate(90, expand=True), (PAD // 2, top))
    return image
