"""sample.py --attention_map=FILE.html, tested in a real browser: headless Chromium (Debian's chromium
and chromium-driver, driven by Selenium) opens the page, clicks tokens and heads, and the numbers it
shows must be the model's own: the weights on the text, and in the panel each step of attention
(q·k, q·k/√d, the masked future as −∞, the softmax, the output's norm and each token's share of it),
with every later token masked and every token before its window out of sight. Skips where no
Chromium is installed; .ci/run installs it."""
import importlib.util
import math
import os
import shutil

import pytest
import torch

from checkpoint import save_checkpoint
from data.tokenizer import CharTokenizer
from helpers import TEXT, check_ok
from model import GPT, GPTConfig

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER and importlib.util.find_spec("selenium")),
                                reason="needs chromium, chromium-driver (apt) and selenium (pip); "
                                       ".ci/run installs them")
BLOCK = 32
HALF = 2 ** -11  # float16's relative rounding: the page keeps scores in half precision
PROMPT = "First Citizen:"


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium, its temporary files in a folder of the tests' (it leaves one in /tmp each start)."""
    from selenium import webdriver
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1200,900"):
        options.add_argument(flag)
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(DRIVER, env={**os.environ, "TMPDIR": str(tmp_path_factory.mktemp("chromium"))})
    driver = webdriver.Chrome(service=service, options=options)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small char-level model of train.py's kind (RoPE, QK-norm), with weights far from uniform
    attention, as out_dir/ckpt.pt."""
    out = tmp_path_factory.mktemp("out")
    tokenizer = CharTokenizer(TEXT)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16,
                       pos_embedding="rope", norm="rmsnorm", qk_norm=True, activation="relu2")
    torch.manual_seed(0)
    model = GPT(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    save_checkpoint({"model": model.state_dict(), "model_config": config.__dict__, "tokenizer": tokenizer.meta()},
                    str(out / "ckpt.pt"))
    return out, model.eval(), tokenizer


def open_page(browser, launch, checkpoint, path, *args):
    """Write the page with sample.py, open it; (its tokens, the model, the tokenizer, sample.py's stdout)."""
    out, model, tokenizer = checkpoint
    proc = check_ok(launch("sample.py", f"--out_dir={out}", f"--start={PROMPT}", f"--attention_map={path}",
                           "--device=cpu", *args))
    browser.get(path.as_uri())
    return browser.execute_script("return DATA.tokens"), model, tokenizer, proc.stdout


def pick(browser, layer, head, query):
    from selenium.webdriver.common.by import By
    browser.find_element(By.CSS_SELECTOR, f'#grid [data-layer="{layer}"][data-head="{head}"]').click()
    browser.find_elements(By.CSS_SELECTOR, "#text .tok")[query].click()


# The page's state is read in one script each, not an element at a time: each WebDriver call is a round
# trip, and reading a 54-token text attribute by attribute took seconds.
TEXT_STATE = """return [...document.querySelectorAll('#text .tok')].map(
    s => [s.dataset.weight, s.classList.contains('masked'), s.classList.contains('outside')])"""
PANEL = """const rows = [...document.querySelectorAll('#steps tbody tr[data-key]')].map(tr => [tr.dataset.key,
    Object.fromEntries([...tr.querySelectorAll('td[class]')].map(td => [td.className, td.innerText]))]);
return [rows, ...['d', 'sum', 'norm'].map(id => document.getElementById(id).innerText)]"""


def text_state(browser):
    """Per token on the text: (its weight, masked?, outside the window?)."""
    return [(float(weight), masked, outside) for weight, masked, outside in browser.execute_script(TEXT_STATE)]


def panel(browser):
    """The panel's table: {key: {column: text}}, and the texts of d, Σ α and |o|."""
    rows, *texts = browser.execute_script(PANEL)
    return {int(key): row for key, row in rows}, *texts  # in the table's order


def expected(model, ids, query):
    """Python's numbers for token `query`, from the forward over its window: (first key, and per layer
    (q·k (nh, L), weights (nh, L), shares (nh, L), |o| (nh,)))."""
    first = max(0, query - BLOCK + 1)
    with torch.no_grad():
        steps = model.attention_steps(torch.tensor([ids[first:query + 1]]))
    numbers = []
    for q, k, v, weights in steps:
        q, k, v, weights = q[0, :, -1], k[0], v[0], weights[0, :, -1]  # the query's row
        brought = weights * v.norm(dim=-1)
        numbers.append(((k @ q[:, :, None])[..., 0], weights, brought / brought.sum(-1, keepdim=True),
                        (weights[:, None, :] @ v)[:, 0].norm(dim=-1)))
    return first, numbers


def three_digits(x):
    """How far the page's q·k (half precision, shown to 3 significant digits) may be from x."""
    return abs(x) * (HALF + 0.005) + 1e-7


def weight_tolerance(w, scaled):
    """How far a weight shown to 3 decimals, from the softmax of half-precision scores, may be from w."""
    return 0.0005 + w * math.expm1(2 * max(abs(s) for s in scaled) * HALF) + 1e-6


def check_panel(browser, model, ids, layer, head, query):
    rows, d, total, norm = panel(browser)
    first, numbers = expected(model, ids, query)
    scores, weights, shares, out_norm = (x[head] for x in numbers[layer])
    hs = model.config.n_embd // model.config.n_head
    assert d == str(hs)
    assert min(rows) == first and [j for j in rows if j <= query] == list(range(first, query + 1))
    scaled = [s.item() / math.sqrt(hs) for s in scores]
    shown = 0.0
    for j in range(first, query + 1):
        row, n = rows[j], j - first
        assert abs(float(row["score"]) - scores[n].item()) <= three_digits(scores[n].item()), \
            (layer, head, query, j, row)
        assert abs(float(row["scaled"]) - scaled[n]) <= three_digits(scaled[n]), (layer, head, query, j, row)
        assert abs(float(row["weight"]) - weights[n].item()) <= weight_tolerance(weights[n].item(), scaled), row
        assert abs(float(row["share"].rstrip("%")) / 100 - shares[n].item()) <= 0.005 + 0.5 / 255 + 1e-6, row
        shown += float(row["weight"])
    for j in (j for j in rows if j > query):  # the future, masked
        assert rows[j]["scaled"] == "−∞" and rows[j]["weight"] == "0.000", rows[j]
    assert total == "1.000" and abs(shown - 1) <= 0.0005 * len(rows) + 1e-6
    assert abs(float(norm) - out_norm.item()) <= out_norm.item() * 5e-4 + 1e-6


def test_the_page_shows_the_whole_text_and_the_models_own_weights(checkpoint, browser, launch, tmp_path):
    tokens, model, tokenizer, stdout = open_page(browser, launch, checkpoint, tmp_path / "attn.html",
                                                 "--max_new_tokens=10")
    assert "2 layers x 2 heads over 24 tokens (14 of the prompt, 10 written)" in stdout, stdout
    assert "".join(tokens).startswith(PROMPT) and len(tokens) == 24  # the prompt and what the model wrote
    with torch.no_grad():
        want = model.attention_weights(torch.tensor([tokenizer.encode("".join(tokens))]))  # per layer (1, nh, T, T)
    ids = tokenizer.encode("".join(tokens))
    checked = 0
    for layer, head in ((0, 0), (1, 1), (1, 0)):  # the grid picks the head
        for query in (0, 9, 23):
            pick(browser, layer, head, query)
            row = want[layer][0, head, query]
            scaled = expected(model, ids, query)[1][layer][0][head] / math.sqrt(8)  # q·k/√d, d = 16 / 2
            for j, (weight, masked, outside) in enumerate(text_state(browser)):
                assert not outside
                if j > query:
                    assert masked and weight == 0, f"token {j} after query {query} is not masked"
                else:
                    assert not masked and abs(weight - row[j].item()) <= weight_tolerance(row[j].item(), scaled), \
                        (layer, head, query, j, weight, row[j].item())
                    checked += 1
    assert checked > 90
    pick(browser, 1, 2, 23)  # head 2 of 2: the average of the layer's heads
    heads = want[1][0, :, 23]  # (nh, T)
    scaled = expected(model, ids, 23)[1][1][0].flatten() / math.sqrt(8)
    for (w, _, _), average in zip(text_state(browser), heads.mean(0)):
        assert abs(w - average.item()) <= weight_tolerance(heads.max().item(), scaled)
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"], "the page logged errors"


def test_the_panel_shows_each_step_of_attention_with_the_models_numbers(checkpoint, browser, launch, tmp_path):
    tokens, model, tokenizer, _ = open_page(browser, launch, checkpoint, tmp_path / "attn.html", "--max_new_tokens=10")
    ids = tokenizer.encode("".join(tokens))
    for layer, head, query in ((0, 0, 0), (0, 1, 9), (1, 0, 13), (1, 1, 23)):
        pick(browser, layer, head, query)
        check_panel(browser, model, ids, layer, head, query)


def test_rows_past_the_window_attend_over_their_own_window(checkpoint, browser, launch, tmp_path):
    """Row i is token i's attention over the block_size tokens up to it, a window that slides; the page
    tells its reader that sampling's window jumped by half a block instead."""
    from selenium.webdriver.common.by import By
    tokens, model, tokenizer, _ = open_page(browser, launch, checkpoint, tmp_path / "attn.html", "--max_new_tokens=40")
    assert "slides along one token at a time, while sampling moved its window in jumps of half a block" in \
        " ".join(browser.find_element(By.TAG_NAME, "p").text.split())
    assert len(tokens) == 54 > BLOCK
    ids = tokenizer.encode("".join(tokens))
    for layer, head, query in ((0, 0, 40), (1, 1, 53)):
        pick(browser, layer, head, query)
        state = text_state(browser)
        assert [j for j, (_, _, outside) in enumerate(state) if outside] == list(range(query - BLOCK + 1))
        assert all(w == 0 for w, _, outside in state if outside)
        check_panel(browser, model, ids, layer, head, query)


def test_with_default_settings_the_page_shows_the_prompt_and_a_line(checkpoint, browser, launch, tmp_path):
    from selenium.webdriver.common.by import By
    tokens, _, _, stdout = open_page(browser, launch, checkpoint, tmp_path / "attn.html")  # no --max_new_tokens
    written = "".join(tokens[len(PROMPT):])
    assert "".join(tokens).startswith(PROMPT) and browser.execute_script("return DATA.n_prompt") == len(PROMPT)
    assert 0 < len(written) <= BLOCK and "\n" not in written.strip(), repr(written)  # one line
    assert written.endswith("\n") or len(written) == BLOCK, repr(written)
    spans = browser.find_elements(By.CSS_SELECTOR, "#text .tok")
    assert ["prompt" in s.get_attribute("class").split() for s in spans] == \
        [i < len(PROMPT) for i in range(len(tokens))]  # the prompt looks different from what the model wrote
    # before any click: the last token of the prompt is chosen, and what follows it is masked
    assert [s.get_attribute("data-index") for s in browser.find_elements(By.CSS_SELECTOR, "#text .tok.query")] == \
        [str(len(PROMPT) - 1)]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#text .tok.masked")) == len(tokens) - len(PROMPT)


def test_the_page_opens_on_the_layer_and_head_asked_for(checkpoint, browser, launch, tmp_path):
    """--attention_layer and --attention_head choose the head a picture draws large, and the one a page opens on."""
    from selenium.webdriver.common.by import By
    tokens, model, tokenizer, _ = open_page(browser, launch, checkpoint, tmp_path / "attn.html", "--max_new_tokens=5",
                                            "--attention_layer=0", "--attention_head=1")  # unequal: a swap shows
    chosen = browser.find_elements(By.CSS_SELECTOR, "#grid .chosen")
    assert [(c.get_attribute("data-layer"), c.get_attribute("data-head")) for c in chosen] == [("0", "1")]
    assert "layer 0, head 1" in browser.find_element(By.CSS_SELECTOR, "#panel h3").text
    check_panel(browser, model, tokenizer.encode("".join(tokens)), 0, 1, len(PROMPT) - 1)  # before any click


def test_arrow_keys_move_along_the_text(checkpoint, browser, launch, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    open_page(browser, launch, checkpoint, tmp_path / "attn.html", "--max_new_tokens=5")
    browser.find_elements(By.CSS_SELECTOR, "#text .tok")[3].click()
    body = browser.find_element(By.TAG_NAME, "body")
    body.send_keys(Keys.ARROW_LEFT)
    body.send_keys(Keys.ARROW_LEFT)
    query = browser.find_elements(By.CSS_SELECTOR, "#text .tok.query")
    assert [q.get_attribute("data-index") for q in query] == ["1"]
    body.send_keys(Keys.ARROW_RIGHT)
    query = browser.find_elements(By.CSS_SELECTOR, "#text .tok.query")
    assert [q.get_attribute("data-index") for q in query] == ["2"]


def test_a_clicked_token_stays_chosen_while_the_pointer_moves_on(checkpoint, browser, launch, tmp_path):
    """The panel is beside the text: the pointer on its way there crossed other tokens, which took the choice.
    A click holds it; a second click on it lets go, and pointing chooses again."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    open_page(browser, launch, checkpoint, tmp_path / "attn.html", "--max_new_tokens=5")
    tokens = browser.find_elements(By.CSS_SELECTOR, "#text .tok")

    def chosen():
        return [q.get_attribute("data-index") for q in browser.find_elements(By.CSS_SELECTOR, "#text .tok.query")]
    tokens[3].click()
    ActionChains(browser).move_to_element(tokens[8]).perform()
    assert chosen() == ["3"]
    tokens[3].click()
    ActionChains(browser).move_to_element(tokens[8]).perform()
    assert chosen() == ["8"]


def test_the_grid_of_small_maps_draws_each_heads_own_weights(checkpoint, browser, launch, tmp_path):
    """Each small map, row i column j, is shaded by the model's weight of token i on token j (the square root,
    as the text is), blank above the diagonal and before the window; a map drawn transposed, or another
    head's, differs."""
    tokens, model, tokenizer, _ = open_page(browser, launch, checkpoint, tmp_path / "attn.html", "--max_new_tokens=5")
    ids = tokenizer.encode("".join(tokens))
    maps = browser.execute_script("""return [...document.querySelectorAll('#grid canvas')].map(c => [+c.dataset.layer,
        +c.dataset.head, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data.filter(
        (_, k) => k % 4 === 0))])""")  # the red channel, row by row
    T = len(ids)
    assert len(maps) == model.config.n_layer * model.config.n_head and all(len(red) == T * T for *_, red in maps)
    shade = torch.full((model.config.n_layer, model.config.n_head, T, T), 255.0)
    for i in range(T):
        first, numbers = expected(model, ids, i)
        for layer, (_, weights, _, _) in enumerate(numbers):
            shade[layer, :, i, first:i + 1] = 255 - (255 * weights.sqrt()).round()
    for layer, head, red in maps:
        drawn = torch.tensor(red, dtype=torch.float32).view(T, T)
        assert (drawn - shade[layer, head]).abs().max() <= 2, (layer, head)  # half-precision weights, rounded
