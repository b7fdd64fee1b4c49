fn main() {
    sbx_doctor::main()
}
